"""The SQS API (AWS JSON 1.0) on the gateway's own port: sans-I/O parts, one module per idea.

``md5`` computes the checksums SDKs compare, ``errors`` maps Pushgate's codes to AWS's,
``names`` turns queue URLs and ARNs into tenants and queues, ``protocol`` parses a request
and builds its answer. See docs/sqs.md for what works and what does not yet.
"""

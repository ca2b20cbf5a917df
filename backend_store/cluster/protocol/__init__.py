"""The node protocol, both sides of the wire: frames, the connection state machine, operations, TLS."""

// Pushgate browser client: an ES module with no build step and no dependencies.
//
//   import { Pushgate } from "https://gateway.example/client/pushgate.js";
//   const pg = new Pushgate("https://gateway.example", { token: () => fetchMyToken() });
//   for await (const message of pg.subscribe("orders", { prefetch: 10 })) {
//     console.log(message.body);
//     await message.ack();
//   }
//
// WebSocket (`pushgate.v1`, first-frame auth: browsers cannot set headers on a WebSocket)
// is the transport; where it is blocked, Server-Sent Events through EventSource with acks
// over fetch. Reconnects with exponential backoff and full jitter, and resubscribes.
// The protocol is described in docs/api.md; the client in docs/browser.md.

export const VERSION = "0.1.0";
export const SUBPROTOCOL = "pushgate.v1";

// Close codes after which reconnecting cannot help without new credentials or a fix.
const AUTH_FAILED = 4001;
const FATAL_CLOSE_CODES = new Set([1002, 1003, 1007, 1008, 1009, 1010, 4003, 4400]);

/** An error with the gateway's stable `code` (see docs/api.md, error codes). */
export class PushgateError extends Error {
  constructor(code, message, status = undefined) {
    super(message || code);
    this.name = "PushgateError";
    this.code = code;
    this.status = status;
  }
}

/** A delay in ms for reconnect attempt `attempt` (0-based): full jitter over an exponential cap. */
export function backoffDelay(attempt, { initialMs = 500, maxMs = 30000 } = {}, random = Math.random) {
  const cap = Math.min(maxMs, initialMs * 2 ** Math.min(attempt, 30));
  return Math.floor(random() * cap);
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** A pushed message: the fields of the wire format (docs/api.md), plus ack() and nack(). */
class Message {
  constructor(client, queue, fields, generation) {
    Object.assign(this, fields);
    this.queue = queue;
    Object.defineProperty(this, "_client", { value: client });
    Object.defineProperty(this, "_generation", { value: generation });
  }

  /** Delete the message. Resolves false when its connection was lost (it will come again). */
  ack() {
    return this._client._settle("ack", this, {});
  }

  /** Give the message back; it becomes visible again after `delayS` seconds. */
  nack(delayS = 0) {
    return this._client._settle("nack", this, { delay_s: delayS });
  }
}

/** One queue's deliveries as an async iterator; `close()` (or leaving a for-await) unsubscribes. */
class Subscription {
  constructor(client, queue, options) {
    this.client = client;
    this.queue = queue;
    this.options = { prefetch: 10, ...options };
    this.closed = false;
    this._buffer = [];
    this._waiters = [];
    this._error = null;
    this.eventSource = null; // the SSE stream, when the client fell back to SSE
    this.startedIn = 0; // the connection generation this subscription was started on
  }

  _push(message) {
    const waiter = this._waiters.shift();
    if (waiter) waiter.resolve({ value: message, done: false });
    else this._buffer.push(message);
  }

  _fail(error) {
    this._error = error;
    this.closed = true;
    for (const waiter of this._waiters.splice(0)) waiter.reject(error);
  }

  _end() {
    this.closed = true;
    for (const waiter of this._waiters.splice(0)) waiter.resolve({ value: undefined, done: true });
  }

  next() {
    if (this._buffer.length) return Promise.resolve({ value: this._buffer.shift(), done: false });
    if (this._error) return Promise.reject(this._error);
    if (this.closed) return Promise.resolve({ value: undefined, done: true });
    return new Promise((resolve, reject) => this._waiters.push({ resolve, reject }));
  }

  async return() {
    await this.close();
    return { value: undefined, done: true };
  }

  [Symbol.asyncIterator]() {
    return this;
  }

  /** Stop deliveries; the gateway makes this subscription's unacked messages visible again. */
  async close() {
    if (this.closed) return;
    this._end();
    await this.client._unsubscribe(this);
  }
}

/** A connection to one gateway, shared by all subscriptions and sends. */
export class Pushgate {
  /**
   * @param {string} url the gateway's base URL, e.g. "https://gateway.example"
   * @param {object} options `token` (a string, or a function returning one or a promise of one;
   *   called again before expiry and on reconnects), `transport` ("auto" | "websocket" | "sse"),
   *   `backoff` ({initialMs, maxMs}), `refreshBeforeS`, `requestTimeoutMs`, `onStateChange`.
   */
  constructor(url, options = {}) {
    if (!options.token) throw new TypeError("Pushgate: options.token is required");
    this.url = url.replace(/\/+$/, "");
    this.options = {
      transport: "auto",
      backoff: { initialMs: 500, maxMs: 30000 },
      refreshBeforeS: 30,
      requestTimeoutMs: 30000,
      ...options,
    };
    this.transport = this.options.transport === "sse" ? "sse" : "websocket";
    this._refusedWhileReachable = false; // a WebSocket was refused while HTTP answered (see _connectLoop)
    this.state = "idle"; // idle | connecting | open | closed
    this.generation = 0; // counts connections, so acks of a lost one are not sent on the next
    this.reconnects = 0;
    this._subs = new Set();
    this._pending = new Map();
    this._nextId = 1;
    this._ws = null;
    this._opened = null;
    this._attempt = 0;
    this._refreshTimer = null;
    this._token = null;
  }

  // Tokens ---------------------------------------------------------------

  async _freshToken() {
    const source = this.options.token;
    this._token = typeof source === "function" ? await source() : source;
    return this._token;
  }

  _scheduleRefresh(expiresAt) {
    clearTimeout(this._refreshTimer);
    if (expiresAt == null || typeof this.options.token !== "function") return;
    const inMs = Math.max(0, (expiresAt - this.options.refreshBeforeS) * 1000 - Date.now());
    this._refreshTimer = setTimeout(() => this.refreshToken().catch(() => {}), inMs);
  }

  /** Get a new token now and hand it to the open connection (WebSocket `auth` frame). */
  async refreshToken() {
    const token = await this._freshToken();
    if (this.transport === "websocket" && this.state === "open") {
      const reply = await this._request({ op: "auth", token });
      this._scheduleRefresh(reply.expires_at);
    }
    return token;
  }

  // Connection ------------------------------------------------------------

  _setState(state) {
    this.state = state;
    if (this.options.onStateChange) this.options.onStateChange(state, this);
  }

  /** Open the connection (subscribe and send do it on demand). Resolves once authenticated. */
  connect() {
    if (this.state === "closed") return Promise.reject(new PushgateError("closed", "client closed"));
    if (!this._opened) this._opened = this._connectLoop();
    return this._opened;
  }

  async _connectLoop() {
    this._setState("connecting");
    for (;;) {
      if (this.state === "closed") throw new PushgateError("closed", "client closed");
      try {
        if (this.transport === "sse") {
          await this._freshToken();
          this.generation += 1;
          this._setState("open");
        } else {
          await this._openWebSocket();
        }
        this._attempt = 0;
        this._refusedWhileReachable = false;
        for (const sub of this._subs) this._startSubscription(sub);
        return;
      } catch (error) {
        if (error.fatal) {
          this._failAll(error);
          this._setState("closed");
          throw error;
        }
        if (error.neverOpened && this.options.transport === "auto" && (await this._httpReachable())) {
          // The gateway answers HTTP. It may just have come up (a restart refused the
          // WebSocket a moment ago): only a second refusal while it answers means that no
          // WebSocket gets through, and the client moves to SSE.
          if (this._refusedWhileReachable) {
            this.transport = "sse";
          } else {
            this._refusedWhileReachable = true;
          }
          continue;
        }
        this._refusedWhileReachable = false;
        await sleep(backoffDelay(this._attempt++, this.options.backoff));
      }
    }
  }

  async _httpReachable() {
    try {
      return (await fetch(`${this.url}/healthz`)).ok;
    } catch {
      return false;
    }
  }

  _openWebSocket() {
    return new Promise((resolve, reject) => {
      const wsUrl = this.url.replace(/^http/, "ws") + "/v1/ws";
      let ws;
      try {
        ws = new WebSocket(wsUrl, SUBPROTOCOL);
      } catch (error) {
        reject(Object.assign(new PushgateError("unavailable", String(error)), { neverOpened: true }));
        return;
      }
      let opened = false;
      let authenticated = false;
      const generation = ++this.generation;
      this._ws = ws;
      ws.onopen = async () => {
        opened = true;
        try {
          const token = await this._freshToken();
          const id = this._nextId++;
          ws.send(JSON.stringify({ op: "auth", token, id }));
          const reply = await this._awaitReply(id, generation);
          authenticated = true;
          this._setState("open");
          this._scheduleRefresh(reply.expires_at);
          resolve();
        } catch (error) {
          reject(error);
          ws.close();
        }
      };
      ws.onmessage = (event) => this._onFrame(JSON.parse(event.data), generation);
      ws.onclose = (event) => {
        this._connectionLost(generation, event.code, event.reason);
        if (!authenticated) {
          const error = new PushgateError(
            event.code === AUTH_FAILED ? "unauthorized" : "unavailable",
            event.reason || `WebSocket closed (${event.code})`,
          );
          error.neverOpened = !opened;
          error.fatal = FATAL_CLOSE_CODES.has(event.code) ||
            (event.code === AUTH_FAILED && typeof this.options.token !== "function");
          reject(error);
          return;
        }
        this._reconnectAfter(event.code, event.reason);
      };
    });
  }

  _reconnectAfter(code, reason) {
    if (this.state === "closed") return;
    const fatal = FATAL_CLOSE_CODES.has(code) ||
      (code === AUTH_FAILED && typeof this.options.token !== "function");
    if (fatal) {
      this._failAll(new PushgateError(code === 4003 ? "forbidden" : "closed", reason || `closed (${code})`));
      this._setState("closed");
      return;
    }
    this.reconnects += 1;
    this._opened = null;
    this._setState("connecting");
    this.connect().catch(() => {});
  }

  _connectionLost(generation, code, reason) {
    if (generation !== this.generation) return;
    clearTimeout(this._refreshTimer);
    const error = new PushgateError("unavailable", reason || `connection closed (${code})`);
    for (const [id, pending] of this._pending) {
      if (pending.generation === generation) {
        this._pending.delete(id);
        pending.reject(error);
      }
    }
  }

  _failAll(error) {
    for (const sub of this._subs) sub._fail(error);
    this._subs.clear();
  }

  /** Close everything; subscriptions end, unacked messages become visible again. */
  close() {
    this._setState("closed");
    clearTimeout(this._refreshTimer);
    for (const sub of this._subs) {
      sub._end();
      if (sub.eventSource) sub.eventSource.close();
    }
    this._subs.clear();
    if (this._ws) this._ws.close(1000);
  }

  // WebSocket frames -------------------------------------------------------

  _onFrame(frame, generation) {
    if (frame.op === "ok" || frame.op === "error" || frame.op === "pong") {
      const pending = this._pending.get(frame.id);
      if (!pending) return;
      this._pending.delete(frame.id);
      if (frame.op === "error") pending.reject(new PushgateError(frame.code, frame.message));
      else pending.resolve(frame);
      return;
    }
    const messages = frame.op === "message" ? [frame.message] : frame.op === "messages" ? frame.messages : [];
    for (const sub of this._subs) {
      if (sub.queue === frame.queue && !sub.closed) {
        for (const fields of messages) sub._push(new Message(this, frame.queue, fields, generation));
      }
    }
  }

  _awaitReply(id, generation) {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this._pending.delete(id);
        reject(new PushgateError("timeout", "no reply from the gateway"));
      }, this.options.requestTimeoutMs);
      this._pending.set(id, {
        generation,
        resolve: (v) => (clearTimeout(timer), resolve(v)),
        reject: (e) => (clearTimeout(timer), reject(e)),
      });
    });
  }

  async _request(frame) {
    await this.connect();
    const id = this._nextId++;
    const reply = this._awaitReply(id, this.generation);
    this._ws.send(JSON.stringify({ ...frame, id }));
    return reply;
  }

  // Subscriptions -----------------------------------------------------------

  /**
   * Deliveries of `queue` as an async iterator of messages (ack each one).
   * Options: `prefetch` (unacked messages at most, default 10), `visibilityTimeoutS`.
   */
  subscribe(queue, options = {}) {
    const sub = new Subscription(this, queue, options);
    this._subs.add(sub);
    if (this.state === "open") this._startSubscription(sub);
    else this.connect().catch((error) => sub._fail(error));
    return sub;
  }

  _startSubscription(sub) {
    if (sub.closed || sub.startedIn === this.generation) return;
    sub.startedIn = this.generation; // once per connection, however the calls interleave
    if (this.transport === "sse") {
      this._openEventSource(sub);
      return;
    }
    const frame = { op: "subscribe", queue: sub.queue, prefetch: sub.options.prefetch, ack: "manual" };
    if (sub.options.visibilityTimeoutS != null) frame.visibility_timeout_s = sub.options.visibilityTimeoutS;
    this._request(frame).catch((error) => {
      // A lost connection resubscribes on reconnect; a refusal (no such queue, scope) ends it.
      if (error.code !== "unavailable" && error.code !== "timeout") {
        this._subs.delete(sub);
        sub._fail(error);
      }
    });
  }

  async _unsubscribe(sub) {
    this._subs.delete(sub);
    if (sub.eventSource) {
      sub.eventSource.close();
      sub.eventSource = null;
      return;
    }
    if (this.transport === "websocket" && this.state === "open") {
      await this._request({ op: "unsubscribe", queue: sub.queue }).catch(() => {});
    }
  }

  _openEventSource(sub, lastEventId = null) {
    const params = new URLSearchParams({ prefetch: String(sub.options.prefetch), access_token: this._token });
    if (sub.options.visibilityTimeoutS != null) params.set("visibility_timeout_s", String(sub.options.visibilityTimeoutS));
    if (lastEventId) params.set("last_event_id", lastEventId);
    const path = `/v1/queues/${encodeURIComponent(sub.queue)}/events`;
    const source = new EventSource(`${this.url}${path}?${params}`);
    sub.eventSource = source;
    let last = lastEventId;
    let attempt = 0;
    source.addEventListener("message", (event) => {
      last = event.lastEventId || last;
      attempt = 0;
      sub._push(new Message(this, sub.queue, JSON.parse(event.data), this.generation));
    });
    source.addEventListener("close", (event) => {
      // The server says why it ends the stream: 4001 needs a new token, 4003 is final.
      const info = JSON.parse(event.data);
      source.close();
      if (info.code === 4003) sub._fail(new PushgateError("forbidden", info.reason));
      else reopen(info.code);
    });
    // EventSource reconnects by itself after a dropped stream (with Last-Event-ID); after an
    // HTTP error (401 once a token expired, 503) it gives up: open a new one with a new token.
    source.onerror = () => {
      if (source.readyState === EventSource.CLOSED) reopen(0);
    };
    const reopen = async (code) => {
      if (sub.closed || this.state === "closed" || sub.eventSource !== source) return;
      if (code === AUTH_FAILED && typeof this.options.token !== "function") {
        sub._fail(new PushgateError("unauthorized", "token expired"));
        return;
      }
      this.reconnects += 1;
      await sleep(backoffDelay(attempt++, this.options.backoff));
      try {
        await this._freshToken();
        // EventSource hides why a stream was refused: ask the queue, so that a refusal that
        // retrying cannot fix (no such queue, no scope) ends the subscription.
        await this._http("GET", `/v1/queues/${encodeURIComponent(sub.queue)}`);
      } catch (error) {
        const transient = ["unavailable", "rate_limited", "internal_error"];
        if (error instanceof PushgateError && !transient.includes(error.code)) {
          sub._fail(error);
          return;
        }
      }
      if (!sub.closed && sub.eventSource === source) this._openEventSource(sub, last);
    };
  }

  async _settle(op, message, extra) {
    if (this.transport === "websocket") {
      if (message._generation !== this.generation || this.state !== "open") return false;
      const reply = await this._request({ op, receipts: [message.receipt], ...extra });
      return op === "nack" || reply.acked === 1;
    }
    const body = await this._http("POST", `/v1/queues/${encodeURIComponent(message.queue)}/${op}`, {
      receipts: [message.receipt],
      ...extra,
    });
    return op === "nack" || body.acked === 1;
  }

  // Sending ------------------------------------------------------------------

  /**
   * Send one message: `body` a string; options `attributes`, `groupId`, `dedupeId`, `delayS`.
   * Resolves to `{id, seq, duplicate}` once the gateway stored it durably.
   */
  async send(queue, body, options = {}) {
    const message = { body };
    if (options.attributes) message.attributes = options.attributes;
    if (options.groupId != null) message.group_id = options.groupId;
    if (options.dedupeId != null) message.dedupe_id = options.dedupeId;
    if (options.delayS != null) message.delay_s = options.delayS;
    if (this.transport === "websocket") {
      const reply = await this._request({ op: "send", queue, ...message });
      return reply.result;
    }
    return this._http("POST", `/v1/queues/${encodeURIComponent(queue)}/messages`, message);
  }

  async _http(method, path, body) {
    const token = this._token ?? (await this._freshToken());
    const response = await fetch(`${this.url}${path}`, {
      method,
      headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await response.text();
    const doc = text ? JSON.parse(text) : {};
    if (!response.ok) throw new PushgateError(doc.code || "unavailable", doc.detail, response.status);
    return doc;
  }
}

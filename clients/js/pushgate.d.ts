// Types for pushgate.js (the Pushgate browser client). See README.md beside this file.

export declare const VERSION: string;
export declare const SUBPROTOCOL: "pushgate.v1";

/** A token, or a function that returns one (called on connect, on reconnects and before expiry). */
export type TokenSource = string | (() => string | Promise<string>);

export interface BackoffOptions {
  /** First reconnect delay cap in ms (default 500); doubles per attempt. */
  initialMs?: number;
  /** Largest delay cap in ms (default 30000). */
  maxMs?: number;
}

export type ConnectionState = "idle" | "connecting" | "open" | "closed";

export interface PushgateOptions {
  token: TokenSource;
  /** "auto" (default): WebSocket, falling back to SSE when WebSocket is blocked. */
  transport?: "auto" | "websocket" | "sse";
  backoff?: BackoffOptions;
  /** Refresh a token this many seconds before it expires (default 30). */
  refreshBeforeS?: number;
  /** A WebSocket request without a reply for this long fails with code "timeout" (default 30000). */
  requestTimeoutMs?: number;
  onStateChange?: (state: ConnectionState, client: Pushgate) => void;
}

export interface SubscribeOptions {
  /** Unacked messages in flight at most (default 10). */
  prefetch?: number;
  visibilityTimeoutS?: number;
}

export interface SendOptions {
  attributes?: Record<string, string>;
  groupId?: string;
  dedupeId?: string;
  delayS?: number;
}

export interface SendResult {
  id: string;
  seq: number;
  duplicate: boolean;
}

/** A pushed message: the wire format's fields (docs/api.md) plus ack() and nack(). */
export interface Message {
  readonly queue: string;
  readonly id: string;
  readonly seq: number;
  readonly receipt: string;
  readonly body?: string;
  readonly body_base64?: string;
  readonly attributes: Record<string, string>;
  readonly group_id: string | null;
  readonly sent_at: number;
  readonly receive_count: number;
  /** Delete it; false when its connection was lost meanwhile (it will be delivered again). */
  ack(): Promise<boolean>;
  /** Give it back, visible again after delayS seconds. */
  nack(delayS?: number): Promise<boolean>;
}

export interface Subscription extends AsyncIterableIterator<Message> {
  readonly queue: string;
  readonly closed: boolean;
  /** Stop deliveries; unacked messages become visible again. */
  close(): Promise<void>;
}

export declare class PushgateError extends Error {
  /** A stable code from docs/api.md ("unauthorized", "forbidden", "queue_not_found", ...),
   * or "unavailable" (connection lost), "timeout", "closed". */
  readonly code: string;
  readonly status?: number;
  constructor(code: string, message?: string, status?: number);
}

export declare class Pushgate {
  constructor(url: string, options: PushgateOptions);
  readonly url: string;
  /** The transport in use: "websocket", or "sse" after a fallback. */
  readonly transport: "websocket" | "sse";
  readonly state: ConnectionState;
  /** How many times the client reconnected. */
  readonly reconnects: number;
  connect(): Promise<void>;
  subscribe(queue: string, options?: SubscribeOptions): Subscription;
  send(queue: string, body: string, options?: SendOptions): Promise<SendResult>;
  refreshToken(): Promise<string>;
  close(): void;
}

/** The reconnect delay for attempt n (0-based): uniform in [0, min(maxMs, initialMs * 2^n)). */
export declare function backoffDelay(attempt: number, options?: BackoffOptions, random?: () => number): number;

/**
 * `MqttLink`: the Reporter's MQTT 3.1.1 client on a WebSocket (subprotocol `mqtt`, binary
 * frames), written for what a Reporter does and nothing more, as edgemon's daemon has its own
 * link and codec: one clean session, PUBLISH at QoS 1, keepalive, reconnection. A general
 * client (mqtt.js) brings Node's streams and Buffer into the browser: 205 kB of the worker's
 * file, against 5 kB for this (docs/how-to/web-player.md, "What it costs").
 *
 * - **Connecting.** `new WebSocket(url, "mqtt")`, then CONNECT (clean session, the client id,
 *   username and password, keepalive); the link is up when the broker's CONNACK accepts it. An
 *   attempt that fails (no socket, a refusal, no CONNACK within `connectTimeoutMs`) is one
 *   `error`, then `close`; the next attempt follows `reconnectPeriodMs` later (0: none).
 * - **Publishing.** `publish(topic, payload, done)` sends one QoS 1 PUBLISH; `done()` when its
 *   PUBACK arrives, `done(error)` when the connection is lost first. A lost message is not
 *   resent by the link: its sender sends its events again in a new message (edgemon applies a
 *   chunk once, by its `seq`), so a link holds nothing across connections.
 * - **Keepalive.** A PINGREQ every `keepaliveS`; a PINGRESP still missing at the next is a
 *   dead connection (`error`, then `close` and a new attempt).
 * - **Reading.** CONNACK, PUBACK and PINGRESP; a WebSocket message may carry any part of a
 *   packet or several. A malformed packet ends the connection as a broken one.
 */

/** MQTT 3.1.1's CONNACK return codes, 1 to 5 (0: accepted). */
const REFUSALS = [
  "unacceptable protocol version", "identifier rejected", "server unavailable",
  "bad user name or password", "not authorized",
];
const CONNECT = 0x10;
const CONNACK = 0x20;
const PUBLISH_QOS1 = 0x32;
const PUBACK = 0x40;
const PINGREQ = new Uint8Array([0xc0, 0x00]);
const PINGRESP = 0xd0;
const DISCONNECT = new Uint8Array([0xe0, 0x00]);
/** The largest remaining length MQTT can say (four bytes of seven bits). */
const MAX_REMAINING = 268_435_455;
/** How long `end` waits for the socket's closing handshake (ms). */
const CLOSE_WAIT_MS = 1_000;

export interface LinkOptions {
  clientId: string;
  username: string;
  password?: string;
  keepaliveS: number;
  reconnectPeriodMs: number;
  connectTimeoutMs: number;
}

/** What the link tells its owner. */
export interface LinkEvents {
  /** The broker accepted the connection (CONNACK 0). */
  connect(): void;
  /** A connection, or an attempt at one, ended. */
  close(): void;
  /** An attempt failed, or a connection broke. */
  error(error: Error): void;
}

const encoder = new TextEncoder();

/** MQTT's variable-length encoding of a remaining length. */
export function remainingLength(length: number): number[] {
  if (!Number.isInteger(length) || length < 0 || length > MAX_REMAINING) {
    throw new RangeError(`an MQTT packet cannot hold ${length} bytes`);
  }
  const out: number[] = [];
  do {
    let byte = length % 128;
    length = Math.floor(length / 128);
    if (length > 0) byte |= 0x80;
    out.push(byte);
  } while (length > 0);
  return out;
}

/** A UTF-8 string field: two bytes of length, then the bytes. */
function field(text: string | Uint8Array): Uint8Array {
  const bytes = typeof text === "string" ? encoder.encode(text) : text;
  if (bytes.length > 0xffff) throw new RangeError("an MQTT string is at most 65,535 bytes");
  const out = new Uint8Array(2 + bytes.length);
  out[0] = bytes.length >> 8;
  out[1] = bytes.length & 0xff;
  out.set(bytes, 2);
  return out;
}

/** A packet: its first byte, the remaining length, then `parts`. */
function packet(first: number, parts: readonly Uint8Array[]): Uint8Array {
  let length = 0;
  for (const part of parts) length += part.length;
  const header = remainingLength(length);
  const out = new Uint8Array(1 + header.length + length);
  out[0] = first;
  out.set(header, 1);
  let at = 1 + header.length;
  for (const part of parts) {
    out.set(part, at);
    at += part.length;
  }
  return out;
}

/** CONNECT, MQTT 3.1.1, a clean session. */
export function connectPacket(options: LinkOptions): Uint8Array {
  const password = options.password !== undefined;
  const flags = 0x02 | 0x80 | (password ? 0x40 : 0);
  const header = new Uint8Array([
    0x00, 0x04, 0x4d, 0x51, 0x54, 0x54, 0x04, flags, options.keepaliveS >> 8, options.keepaliveS & 0xff,
  ]);
  const parts = [header, field(options.clientId), field(options.username)];
  if (password) parts.push(field(options.password as string));
  return packet(CONNECT, parts);
}

/** PUBLISH at QoS 1 of `payload` on the topic whose field is `topic` (`field(name)`). */
export function publishPacket(topic: Uint8Array, id: number, payload: Uint8Array): Uint8Array {
  return packet(PUBLISH_QOS1, [topic, new Uint8Array([id >> 8, id & 0xff]), payload]);
}

/** The first whole packet at the start of `bytes`: [first byte, body, its length in all], or
 * null while it is incomplete. Throws on a remaining length longer than four bytes. */
export function readPacket(bytes: Uint8Array): [number, Uint8Array, number] | null {
  let length = 0;
  let scale = 1;
  for (let at = 1; at <= 4; at += 1) {
    const byte = bytes[at];
    if (byte === undefined) return null;
    length += (byte & 0x7f) * scale;
    if ((byte & 0x80) === 0) {
      const end = at + 1 + length;
      if (bytes.length < end) return null;
      return [bytes[0] as number, bytes.subarray(at + 1, end), end];
    }
    scale *= 128;
  }
  throw new RangeError("a remaining length longer than four bytes");
}

export class MqttLink {
  private socket: WebSocket | null = null;
  private connected = false;
  private ended = false;
  private nextId = 1;
  private readonly pending = new Map<number, (error?: Error) => void>();
  private readonly topics = new Map<string, Uint8Array>();
  private received: Uint8Array = new Uint8Array(0);
  private waitingPong = false;
  private attemptTimer: ReturnType<typeof setTimeout> | undefined;
  private retryTimer: ReturnType<typeof setTimeout> | undefined;
  private pingTimer: ReturnType<typeof setInterval> | undefined;
  private closed: (() => void) | null = null;

  /** Throws on a URL that is not ws:// or wss://; connects in the background. */
  constructor(
    private readonly url: string,
    private readonly options: LinkOptions,
    private readonly events: LinkEvents,
  ) {
    const protocol = new URL(url).protocol;
    if (protocol !== "ws:" && protocol !== "wss:") {
      throw new Error(`edgemon-reporter speaks MQTT over WebSocket: ws:// or wss://, not ${url}`);
    }
    this.attempt();
  }

  /** Send `payload` on `topic` at QoS 1; `done` once acknowledged, or with the error that
   * lost it. */
  publish(topic: string, payload: Uint8Array, done: (error?: Error) => void): void {
    const socket = this.socket;
    if (socket === null || !this.connected) {
      queueMicrotask(() => done(new Error("not connected")));
      return;
    }
    let id = this.nextId;
    while (this.pending.has(id)) id = id === 0xffff ? 1 : id + 1;
    this.nextId = id === 0xffff ? 1 : id + 1;
    let name = this.topics.get(topic);
    if (name === undefined) {
      name = field(topic);
      this.topics.set(topic, name);
    }
    this.pending.set(id, done);
    socket.send(publishPacket(name, id, payload));
  }

  /** DISCONNECT and close, no further attempt; `done` once the socket has closed. */
  end(done: () => void): void {
    this.ended = true;
    clearTimeout(this.retryTimer);
    const socket = this.socket;
    if (socket === null) {
      queueMicrotask(done);
      return;
    }
    const timer = setTimeout(() => this.finish(), CLOSE_WAIT_MS);
    this.closed = () => {
      clearTimeout(timer);
      done();
    };
    try {
      if (this.connected) socket.send(DISCONNECT);
    } catch {
      // closing anyway
    }
    this.drop(socket, null);
  }

  // ---------------------------------------------------------------- inside
  private attempt(): void {
    if (this.ended) return;
    let socket: WebSocket;
    try {
      socket = new WebSocket(this.url, "mqtt");
    } catch (error) {
      this.events.error(error instanceof Error ? error : new Error(String(error)));
      this.events.close();
      this.retry();
      return;
    }
    socket.binaryType = "arraybuffer";
    this.socket = socket;
    this.received = new Uint8Array(0);
    this.attemptTimer = setTimeout(() => {
      this.drop(socket, new Error(`no CONNACK within ${this.options.connectTimeoutMs} ms`));
    }, this.options.connectTimeoutMs);
    socket.onopen = () => socket.send(connectPacket(this.options));
    socket.onmessage = (event: MessageEvent) => this.receive(socket, event.data);
    socket.onerror = () => this.drop(socket, new Error(`WebSocket error on ${this.url}`));
    socket.onclose = (event: CloseEvent) => {
      if (socket === this.socket) {
        const cause = this.connected ? null : new Error(`WebSocket closed (${event.code}) on ${this.url}`);
        this.drop(socket, cause);
      }
      this.finish();
    };
  }

  private receive(socket: WebSocket, data: unknown): void {
    if (socket !== this.socket) return;
    if (!(data instanceof ArrayBuffer)) {
      this.drop(socket, new Error("the broker sent a text frame"));
      return;
    }
    const incoming = new Uint8Array(data);
    let bytes = incoming;
    if (this.received.length > 0) {
      bytes = new Uint8Array(this.received.length + incoming.length);
      bytes.set(this.received);
      bytes.set(incoming, this.received.length);
    }
    try {
      let read = readPacket(bytes);
      while (read !== null && socket === this.socket) {
        const [first, body, length] = read;
        this.handle(socket, first, body);
        bytes = bytes.subarray(length);
        read = readPacket(bytes);
      }
    } catch (error) {
      this.drop(socket, error instanceof Error ? error : new Error(String(error)));
      return;
    }
    if (socket === this.socket) this.received = bytes.length > 0 ? bytes.slice() : new Uint8Array(0);
  }

  private handle(socket: WebSocket, first: number, body: Uint8Array): void {
    if (first === PUBACK && body.length === 2) {
      const id = ((body[0] as number) << 8) | (body[1] as number);
      const done = this.pending.get(id);
      this.pending.delete(id);
      done?.();
    } else if (first === PINGRESP) {
      this.waitingPong = false;
    } else if (first === CONNACK && body.length === 2 && !this.connected) {
      const code = body[1] as number;
      if (code !== 0) {
        const reason = REFUSALS[code - 1] ?? `return code ${code}`;
        this.drop(socket, new Error(`the broker refused the connection: ${reason}`));
        return;
      }
      clearTimeout(this.attemptTimer);
      this.connected = true;
      if (this.options.keepaliveS > 0) {
        this.pingTimer = setInterval(() => this.ping(socket), this.options.keepaliveS * 1000);
      }
      this.events.connect();
    } else {
      throw new Error(`an unexpected MQTT packet (first byte 0x${first.toString(16)})`);
    }
  }

  private ping(socket: WebSocket): void {
    if (this.waitingPong) {
      this.drop(socket, new Error(`no PINGRESP within ${this.options.keepaliveS} s`));
      return;
    }
    this.waitingPong = true;
    socket.send(PINGREQ);
  }

  /** The connection (or attempt) on `socket` is over; `cause` is its error, if any. */
  private drop(socket: WebSocket, cause: Error | null): void {
    if (socket !== this.socket) return;
    this.socket = null;
    this.connected = false;
    this.waitingPong = false;
    this.received = new Uint8Array(0);
    clearTimeout(this.attemptTimer);
    clearInterval(this.pingTimer);
    socket.onmessage = null;
    socket.onerror = null;
    try {
      socket.close();
    } catch {
      // already closing
    }
    const lost = [...this.pending.values()];
    this.pending.clear();
    const error = cause ?? new Error("connection closed");
    for (const done of lost) done(error);
    if (cause !== null && !this.ended) this.events.error(cause);
    this.events.close();
    this.retry();
  }

  private retry(): void {
    if (this.ended || this.options.reconnectPeriodMs <= 0) return;
    clearTimeout(this.retryTimer);
    this.retryTimer = setTimeout(() => this.attempt(), this.options.reconnectPeriodMs);
  }

  private finish(): void {
    const closed = this.closed;
    this.closed = null;
    closed?.();
  }
}

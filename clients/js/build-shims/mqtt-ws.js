// The browser bundle's `mqtt`: mqtt.js's own client and WebSocket transport
// (`mqtt/lib/client`, `mqtt/lib/connect/ws`), without the TCP, TLS, WeChat and Alipay
// transports and the URL polyfill of its full browser build. `connect(url, options)` takes a
// ws:// or wss:// URL, as mqtt.js's `connect` does.
import MqttClient from "mqtt/lib/client";
import { browserStreamBuilder } from "mqtt/lib/connect/ws";

export function connect(url, options) {
  const parsed = new URL(url);
  const protocol = parsed.protocol.replace(/:$/, "");
  if (protocol !== "ws" && protocol !== "wss") {
    throw new Error(`edgemon-reporter speaks MQTT over WebSocket: ws:// or wss://, not ${url}`);
  }
  const opts = {
    ...options,
    protocol,
    hostname: parsed.hostname,
    port: parsed.port ? Number(parsed.port) : protocol === "wss" ? 443 : 80,
    path: `${parsed.pathname}${parsed.search}`,
  };
  return new MqttClient((client) => browserStreamBuilder(client, opts), opts);
}

// Parses MQTT packets with mqtt-packet (Debian's node-mqtt-packet), an MQTT codec independent
// of edgemon's: tests/strict_peer.py runs it. Input on stdin, JSON:
//   {"version": 4 | 5, "frames": [{"dir": "out" | "in", "hex": "<one whole packet>"}]}
// Output on stdout, JSON, one entry per frame: {"packet": {...}} or {"error": "..."}.
// Each direction has its own parser (it keeps the protocol version a CONNECT announces).
"use strict";
const mqtt = require("mqtt-packet");

function plain(packet) {
  const out = {};
  for (const [key, value] of Object.entries(packet)) {
    out[key] = Buffer.isBuffer(value) ? value.toString("hex") : value;
  }
  return out;
}

let input = "";
process.stdin.on("data", (chunk) => { input += chunk; });
process.stdin.on("end", () => {
  const request = JSON.parse(input);
  const parsers = {};
  const results = request.frames.map((frame) => {
    let parser = parsers[frame.dir];
    if (parser === undefined) {
      parser = parsers[frame.dir] = mqtt.parser({ protocolVersion: request.version });
    }
    const found = [];
    const errors = [];
    const onPacket = (packet) => found.push(plain(packet));
    const onError = (error) => errors.push(error.message);
    parser.on("packet", onPacket);
    parser.on("error", onError);
    const left = parser.parse(Buffer.from(frame.hex, "hex"));
    parser.removeListener("packet", onPacket);
    parser.removeListener("error", onError);
    if (errors.length > 0) return { error: errors.join("; ") };
    if (found.length !== 1 || left !== 0) {
      return { error: `${found.length} packets, ${left} bytes left in one frame` };
    }
    return { packet: found[0] };
  });
  process.stdout.write(JSON.stringify(results));
});

// Node's string_decoder, which readable-stream asks for, on the browser's TextDecoder (the
// `string_decoder` package brings its own UTF-8 decoder and safe-buffer). readable-stream
// decodes only for a stream given an encoding (setEncoding), which mqtt.js never asks for;
// UTF-8 and UTF-16LE, as TextDecoder has them; another encoding is refused when the decoder
// is made.
const NAMES = { utf8: "utf-8", "utf-8": "utf-8", utf16le: "utf-16le", "utf-16le": "utf-16le", ucs2: "utf-16le", "ucs-2": "utf-16le" };

class StringDecoder {
  constructor(encoding = "utf8") {
    const name = NAMES[String(encoding).toLowerCase()];
    if (name === undefined) throw new TypeError(`Unknown encoding: ${encoding}`);
    this.encoding = name === "utf-8" ? "utf8" : "utf16le";
    this.decoder = new TextDecoder(name);
  }
  write(buffer) {
    return typeof buffer === "string" ? buffer : this.decoder.decode(buffer, { stream: true });
  }
  end(buffer) {
    const head = buffer === undefined ? "" : this.write(buffer);
    return head + this.decoder.decode();
  }
}

module.exports = { StringDecoder };

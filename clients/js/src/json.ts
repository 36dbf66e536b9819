/**
 * Events as JSON, byte for byte as the Python `Reporter` writes them (`json.JSONEncoder`
 * with `separators=(",", ":")`): numbers that are floats there keep a fraction (`80.0`, not
 * `80`) and use Python's exponent form (`1e-05`), `seq` stays an integer, and every character
 * outside printable ASCII is escaped (`ensure_ascii`). Keys keep their insertion order.
 */

/** Fields whose values are integers on the wire; every other number is a float. */
const INTEGER_FIELDS = new Set(["seq"]);

/** `x` (finite) as Python's `repr(float)` writes it. */
export function pyFloat(x: number): string {
  if (x === 0) return Object.is(x, -0) ? "-0.0" : "0.0";
  const size = Math.abs(x);
  if (size >= 1e-4 && size < 1e16) {
    // Both write these positionally, with the same shortest digits.
    const text = String(x);
    return text.includes(".") ? text : `${text}.0`;
  }
  const exponential = x.toExponential(); // the shortest digits that read back as x
  const at = exponential.indexOf("e");
  const exponent = Number(exponential.slice(at + 1));
  if (exponent < -4 || exponent >= 16) {
    const mantissa = exponential.slice(0, at);
    const sign = exponent < 0 ? "-" : "+";
    const digits = String(Math.abs(exponent)).padStart(2, "0");
    return `${mantissa}e${sign}${digits}`;
  }
  const text = String(x); // positional for 1e-6 ≤ |x| < 1e21: the same digits
  return text.includes(".") ? text : `${text}.0`;
}

/** A string as Python's `json` writes it with `ensure_ascii`. */
export function pyString(text: string): string {
  return JSON.stringify(text).replace(
    /[\u007f-\uffff]/g,
    (ch) => `\\u${ch.charCodeAt(0).toString(16).padStart(4, "0")}`,
  );
}

/** One event object. */
export function encodeEvent(event: Readonly<Record<string, unknown>>): string {
  const parts: string[] = [];
  for (const key of Object.keys(event)) {
    const value = event[key];
    let text: string;
    if (typeof value === "number") {
      text = INTEGER_FIELDS.has(key) ? String(value) : pyFloat(value);
    } else if (typeof value === "string") {
      text = pyString(value);
    } else if (typeof value === "boolean") {
      text = value ? "true" : "false";
    } else {
      continue; // undefined: not on the wire
    }
    parts.push(`"${key}":${text}`); // the wire's keys: plain ASCII names
  }
  return `{${parts.join(",")}}`;
}

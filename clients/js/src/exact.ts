/**
 * Exact sums of audio, as the Python `Reporter` keeps them (`fractions.Fraction`): every
 * finite double is an integer multiple of 2^-1074, so a sum of them is kept exactly as a
 * BigInt count of 2^-1074 units, and rounded to the nearest double once, when it is read.
 * So `audio_total_ms` is the same number, to the last bit, as the Python client's on the
 * same calls, whatever `audio_ms` values were added (80 ms chunks are exact in any case;
 * 83.33… ms ones are not).
 */

const UNIT_BITS = 1074n;
const VIEW = new DataView(new ArrayBuffer(8));

/** `x` (finite, ≥ 0) in units of 2^-1074, exactly. */
export function toUnits(x: number): bigint {
  VIEW.setFloat64(0, x);
  const high = VIEW.getUint32(0);
  const low = VIEW.getUint32(4);
  const exponent = (high >>> 20) & 0x7ff;
  const mantissa = (BigInt(high & 0xfffff) << 32n) | BigInt(low);
  if (exponent === 0) return mantissa; // subnormal (or zero): mantissa × 2^-1074
  return ((1n << 52n) | mantissa) << BigInt(exponent - 1);
}

/** `x × 2^-k` for k ≥ 0, exact while the result is a normal double (it is, here). */
function scaleDown(x: number, k: bigint): number {
  let value = x;
  let left = k;
  while (left > 1000n) {
    value *= 2 ** -1000;
    left -= 1000n;
  }
  return value * 2 ** -Number(left);
}

/** The double nearest `num / den` (both ≥ 0, den > 0), ties to even: rounded once. */
export function ratioToNumber(num: bigint, den: bigint): number {
  if (num === 0n) return 0;
  // A quotient of at least 64 bits, and a sticky bit for what the division left over, so
  // that Number() (round to nearest, ties to even) sees no false tie.
  const shift = BigInt(den.toString(2).length - num.toString(2).length + 66);
  let quotient: bigint;
  let rest: bigint;
  if (shift >= 0n) {
    const scaled = num << shift;
    quotient = scaled / den;
    rest = scaled % den;
  } else {
    const divisor = den << -shift;
    quotient = num / divisor;
    rest = num % divisor;
  }
  if (rest !== 0n) quotient |= 1n;
  const rounded = Number(quotient);
  return shift >= 0n ? scaleDown(rounded, shift) : rounded * 2 ** Number(-shift);
}

/** The audio of a stream: `base` (ms given as such, exact) plus `frames` whole frames at
 * `rate` Hz (integers while the format stays the same), as the Python `_Stream` keeps it. */
/** Whether `a + b` is exact in doubles (Knuth's TwoSum: its rounding error is zero). */
function exactSum(a: number, b: number): boolean {
  const sum = a + b;
  const bPart = sum - a;
  const aPart = sum - bPart;
  return Number.isFinite(sum) && a - aPart + (b - bPart) === 0;
}

/** The audio of a stream: `base` (ms given as such, exact) plus `frames` whole frames at
 * `rate` Hz (integers while the format stays the same), as the Python `_Stream` keeps it.
 * While every sum of ms is exact in doubles (80 ms chunks, say) the base is a double; the
 * first inexact one moves it to BigInt units, exact from then on. */
export class AudioTotal {
  private fast = 0; // the base while every sum was exact
  private units: bigint | null = null; // the base in units of 2^-1074 ms, once one was not
  private frames = 0;
  private rate = 0; // 0: no frames counted yet
  /** Frames of earlier formats: (ms numerator, denominator) pairs, exact. */
  private readonly pending: [bigint, bigint][] = [];

  /** Count `frames` whole frames at `rate` Hz; their milliseconds. */
  addFrames(frames: number, rate: number): number {
    if (rate !== this.rate) {
      if (this.rate !== 0 && this.frames !== 0) {
        this.pending.push([BigInt(this.frames) * 1000n, BigInt(this.rate)]);
      }
      this.rate = rate;
      this.frames = 0;
    }
    this.frames += frames;
    return (frames * 1000) / rate;
  }

  /** Count `ms` milliseconds given as such. */
  addMs(ms: number): void {
    if (this.units !== null) {
      this.units += toUnits(ms);
    } else if (exactSum(this.fast, ms)) {
      this.fast += ms;
    } else {
      this.units = toUnits(this.fast) + toUnits(ms);
    }
  }

  /** All audio counted so far, rounded once. */
  totalMs(): number {
    const rate = this.rate;
    if (this.units === null && this.pending.length === 0) {
      if (rate === 0) return this.fast;
      if (this.fast === 0) return (this.frames * 1000) / rate;
    }
    if (rate === 0 && this.pending.length === 0) {
      return ratioToNumber(this.units ?? toUnits(this.fast), 1n << UNIT_BITS);
    }
    // base / 2^1074 + Σ pending + frames × 1000 / rate, as one ratio.
    let num = this.units ?? toUnits(this.fast);
    let den = 1n << UNIT_BITS;
    const parts: [bigint, bigint][] = [...this.pending];
    if (rate !== 0) parts.push([BigInt(this.frames) * 1000n, BigInt(rate)]);
    for (const [n, d] of parts) {
      num = num * d + n * den;
      den *= d;
    }
    return ratioToNumber(num, den);
  }
}

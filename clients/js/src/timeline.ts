/**
 * A media clock (an AudioContext's `currentTime`, a media element's `currentTime`) read on
 * the Reporter's clock. `offset = clock − media time` is the same for every sample while the
 * media clock runs with the page's; it grows while the media clock stands still (paused,
 * suspended, stalled, a glitch of the audio device). So a stream's **play start**, the
 * instant at which its first audio would have played had it never stopped, is
 * `offset + media time of its first audio + the stream's own stalls`: what edgemon's
 * `play_start_ms` means (the latest one given counts), moved by every pause and stall.
 *
 * The media clock advances in steps (an AudioContext by its device's callback, ~10 ms), so a
 * single sample overstates the offset by up to a step: the timeline keeps the smallest one
 * seen since the media clock last stood still, and takes a larger one when it is beyond
 * `stepMs` (the clock stood still since).
 */

export class Timeline {
  private offset = Number.NaN;

  constructor(
    private readonly clock: () => number,
    private readonly mediaMs: () => number,
    private readonly running: () => boolean,
    private readonly stepMs = 25,
  ) {}

  /** The offset now (the Reporter's clock minus the media clock, ms). */
  sample(): number {
    return this.sampleAt(this.clock(), this.mediaMs());
  }

  /** The offset from readings just taken: the Reporter's clock and the media clock (ms). */
  sampleAt(clockMs: number, mediaMs: number): number {
    const observed = clockMs - mediaMs;
    if (!this.running()) {
      // The media clock stands still: were it to run again now, this is the offset.
      this.offset = observed;
    } else if (Number.isNaN(this.offset) || observed < this.offset || observed - this.offset > this.stepMs) {
      this.offset = observed;
    }
    return this.offset;
  }

  /** A media time (ms) on the Reporter's clock. */
  at(mediaMs: number): number {
    return this.sample() + mediaMs;
  }
}

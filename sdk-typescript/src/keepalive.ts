// An open handle keeps the process alive the way a listening net.Server
// does: with a ref'd timer that never fires, until the handle closes or
// `unref()` is called. Nothing native does this, so a closed client, whose
// handles are closed, never holds the process.
const FAR = 2 ** 31 - 1;

export class KeepAlive {
  #timer: NodeJS.Timeout | null = setInterval(() => {}, FAR);

  unref(): void {
    this.#timer?.unref();
  }

  ref(): void {
    this.#timer?.ref();
  }

  release(): void {
    if (this.#timer !== null) {
      clearInterval(this.#timer);
      this.#timer = null;
    }
  }
}

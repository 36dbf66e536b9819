// mqtt.js keeps MQTT 5 topic aliases in an LRUCache; the Reporter speaks MQTT 3.1.1 (no
// aliases), so the bundle carries this Map-based cache of the same calls instead.
export class LRUCache {
  constructor({ max }) {
    this.max = max;
    this.map = new Map();
  }
  get size() {
    return this.map.size;
  }
  get(key) {
    if (!this.map.has(key)) return undefined;
    const value = this.map.get(key);
    this.map.delete(key);
    this.map.set(key, value);
    return value;
  }
  set(key, value) {
    this.map.delete(key);
    this.map.set(key, value);
    if (this.map.size > this.max) this.map.delete(this.map.keys().next().value);
    return this;
  }
  has(key) {
    return this.map.has(key);
  }
  delete(key) {
    return this.map.delete(key);
  }
  clear() {
    this.map.clear();
  }
  keys() {
    return this.map.keys();
  }
}

// mqtt.js and mqtt-packet log through `debug` (`require("debug")(namespace)`); the bundle
// leaves their messages out. CommonJS, as they require it.
module.exports = function debug() {
  const log = () => {};
  log.enabled = false;
  return log;
};

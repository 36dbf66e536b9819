// process-nextick-args for mqtt-packet: the bundle's process.nextTick (build-shims/process.cjs).
module.exports = { nextTick: require("./process.cjs").nextTick };

// bl for mqtt-packet: its parser calls `bl()` and uses the result as a list of buffers
// (append, consume, length, slice, readUInt*), which is bl's BufferList (`require("bl")
// .BufferList`); the stream around it (BufferListStream, a readable-stream Duplex) is not used.
const BufferList = require("bl/BufferList.js");

module.exports = function bl(initial) {
  return new BufferList(initial);
};
module.exports.BufferList = BufferList;

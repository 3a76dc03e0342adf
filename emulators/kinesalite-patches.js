// Fixes to kinesalite 3.3.3 that the project depends on, applied before kinesalite loads.
//
// GetShardIterator AT_TIMESTAMP: kinesalite looks for the first record that arrived at or
// after the timestamp and never answers when there is none (an empty shard, or a timestamp
// after the last record): the client hangs until its read timeout. Kinesis answers with an
// iterator positioned after the last record, like LATEST. Read-back depends on this.
'use strict'

const path = require('path')

function patchGetShardIterator(kinesaliteDir) {
  const actionPath = require.resolve(path.join(kinesaliteDir, 'actions', 'getShardIterator'))
  const original = require(actionPath)
  const db = require(path.join(kinesaliteDir, 'db'))

  function getShardIterator(store, data, cb) {
    if (data.ShardIteratorType !== 'AT_TIMESTAMP' || data.Timestamp == null) {
      return original(store, data, cb)
    }
    const shardIx = parseInt(String(data.ShardId).split('-')[1], 10)
    if (!(shardIx >= 0)) return original(store, data, cb)
    const opts = { gt: db.shardIxToHex(shardIx), lt: db.shardIxToHex(shardIx + 1) }
    let found = false
    db.lazy(store.getStreamDb(data.StreamName).createReadStream(opts), cb)
      .filter(function (item) { return item.value.ApproximateArrivalTimestamp >= data.Timestamp })
      .take(1)
      .join(function (items) {
        found = items.length > 0
        if (found) return original(store, data, cb)
        // nothing at or after the timestamp: position at the tip, as Kinesis does
        return original(store, Object.assign({}, data, { ShardIteratorType: 'LATEST', Timestamp: undefined }), cb)
      })
  }

  require.cache[actionPath].exports = getShardIterator
}

module.exports = function applyKinesalitePatches(kinesaliteDir) {
  patchGetShardIterator(kinesaliteDir)
}

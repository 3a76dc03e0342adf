// Fixes to dynalite 4 that the project depends on, applied before dynalite loads.
//
// ReturnValuesOnConditionCheckFailure: DynamoDB returns the item a failed condition saw (in
// the ConditionalCheckFailedException's `Item`) when a PutItem, UpdateItem or DeleteItem asks
// for ALL_OLD; dynalite accepts the parameter and ignores it. The ledger relies on the item
// to judge a lost claim without a second request, as on AWS. The ledger still falls back to a
// consistent read when no item comes back (tests cover both paths).
'use strict'

const path = require('path')

function patchConditionalFailure(dynaliteDir) {
  // dynalite drops request parameters its validations do not list: list this one
  for (const action of ['putItem', 'updateItem', 'deleteItem']) {
    require(path.join(dynaliteDir, 'validations', action)).types.ReturnValuesOnConditionCheckFailure = {
      type: 'String',
      enum: ['ALL_OLD', 'NONE'],
    }
  }
  const db = require(path.join(dynaliteDir, 'db'))
  const checkConditional = db.checkConditional
  db.checkConditional = function (data, existingItem) {
    const err = checkConditional(data, existingItem)
    if (err && existingItem && data.ReturnValuesOnConditionCheckFailure === 'ALL_OLD') {
      err.body.Item = existingItem
    }
    return err
  }
}

module.exports = function applyDynalitePatches(dynaliteDir) {
  patchConditionalFailure(dynaliteDir)
}

#!/usr/bin/env node
// Start one emulator of the local stack, bound to 127.0.0.1 only.
//
//   node emulators/serve.js kinesalite    --port P --path DIR
//   node emulators/serve.js dynalite      --port P --path DIR
//   node emulators/serve.js kinesis-local --port P --tls-port Q --path DIR
//
// Without --path the store lives in memory. --host ADDR binds another address than 127.0.0.1:
// for docker-compose.yml only, where each emulator has a container of its own and the other
// services reach it by name on the project's private network (it publishes no port). The packages are loaded from KEO_NODE_MODULES
// (default: the node_modules next to this directory). Prints one line
// "<name> listening on http://127.0.0.1:<port>" once the plain HTTP port accepts connections.
//
// Why a launcher: kinesalite's CLI has no --host, so it listens on every interface; and
// kinesis-local (kinesis-mock built with scala.js) hard-codes the host "0.0.0.0" with no
// setting to change it. An emulator that accepts anything must never be reachable from the
// network, so every server created here is forced onto the loopback interface.
'use strict'

const net = require('net')
const path = require('path')

const LOOPBACK = '127.0.0.1'
let HOST = LOOPBACK
// State transitions (CREATING -> ACTIVE, ...) are instant for tests; real AWS takes seconds,
// and the project's code waits with waiters, so short delays still exercise that path.
const TRANSITION_MS = 50
const NAMES = ['kinesalite', 'dynalite', 'kinesis-local']

function usage(message) {
  if (message) process.stderr.write(`serve.js: ${message}\n`)
  process.stderr.write(
    'usage: node emulators/serve.js {kinesalite|dynalite|kinesis-local} ' +
      '--port PORT [--tls-port PORT] [--path DIR] [--host ADDR]\n',
  )
  process.exit(2)
}

function parseArgs(argv) {
  const [name, ...rest] = argv
  if (!NAMES.includes(name)) usage(`unknown emulator ${JSON.stringify(name)}`)
  const options = { name }
  for (let i = 0; i < rest.length; i += 2) {
    const flag = rest[i]
    const value = rest[i + 1]
    if (value === undefined) usage(`${flag} needs a value`)
    if (flag === '--port') options.port = parsePort(flag, value)
    else if (flag === '--tls-port') options.tlsPort = parsePort(flag, value)
    else if (flag === '--path') options.path = path.resolve(value)
    else if (flag === '--host') HOST = parseHost(flag, value)
    else usage(`unknown flag ${flag}`)
  }
  if (options.port === undefined) usage('--port is required')
  if (name === 'kinesis-local' && options.tlsPort === undefined) {
    usage('kinesis-local needs --tls-port (it always opens a TLS port too)')
  }
  return options
}

function parseHost(flag, value) {
  if (net.isIP(value) === 0) usage(`${flag}: not an IP address: ${value}`)
  return value
}

function parsePort(flag, value) {
  const port = Number(value)
  if (!Number.isInteger(port) || port < 1 || port > 65535) usage(`${flag}: bad port ${value}`)
  return port
}

function nodeModules() {
  return process.env.KEO_NODE_MODULES || path.join(__dirname, '..', 'node_modules')
}

function load(pkg) {
  return require(path.join(nodeModules(), pkg))
}

function announce(name, port) {
  console.log(`${name} listening on http://${HOST}:${port}`)
}

function exitOnListenError(name, server) {
  server.on('error', (err) => {
    console.error(`${name}: ${err.code === 'EADDRINUSE' ? 'port in use' : 'cannot listen'}: ${err.message}`)
    process.exit(err.code === 'EADDRINUSE' ? 98 : 1)
  })
}

// A client that hangs up in the middle of a request body (a process killed during a put, a
// timed-out SDK call) makes Node emit 'error' (ECONNRESET, "aborted") on the request, and both
// kinesalite and dynalite answer that with `req.on('error', (err) => { throw err })`: the
// emulator dies, and every later client meets a closed port. AWS serves on. So every request's
// 'error' listeners are wrapped, before the emulator's own handler adds its own (this listener
// runs first): a client gone is logged and forgotten; any other error is theirs to handle.
const CLIENT_GONE = new Set(['ECONNRESET', 'ECONNABORTED', 'EPIPE'])

function surviveClientsThatHangUp(server) {
  server.prependListener('request', (req) => {
    const on = req.on
    req.on = function (event, listener) {
      if (event !== 'error') return on.call(this, event, listener)
      return on.call(this, event, (err) => {
        if (CLIENT_GONE.has(err.code) || err.message === 'aborted') {
          console.error(`client gone mid-request (${err.code || err.message}): ignored`)
          return
        }
        listener(err)
      })
    }
  })
}

function serveLevelDbEmulator(options, extra) {
  if (options.name === 'kinesalite') {
    // fixes kinesalite needs before it loads (see kinesalite-patches.js)
    require('./kinesalite-patches.js')(path.join(nodeModules(), 'kinesalite'))
  }
  if (options.name === 'dynalite') {
    // DynamoDB's ReturnValuesOnConditionCheckFailure (see dynalite-patches.js)
    require('./dynalite-patches.js')(path.join(nodeModules(), 'dynalite'))
  }
  const factory = load(options.name)
  const server = factory({ path: options.path, ...extra })
  exitOnListenError(options.name, server)
  surviveClientsThatHangUp(server)
  server.listen(options.port, HOST, () => announce(options.name, server.address().port))
  return server
}

function serveKinesisLocal(options) {
  const pkgDir = path.join(nodeModules(), 'kinesis-local')
  const ms = `${TRANSITION_MS}ms`
  const env = {
    KINESIS_MOCK_PLAIN_PORT: String(options.port),
    KINESIS_MOCK_TLS_PORT: String(options.tlsPort),
    // resolved against the working directory otherwise
    KINESIS_MOCK_CERT_PATH: path.join(pkgDir, 'server.json'),
    CREATE_STREAM_DURATION: ms,
    DELETE_STREAM_DURATION: ms,
    REGISTER_STREAM_CONSUMER_DURATION: ms,
    DEREGISTER_STREAM_CONSUMER_DURATION: ms,
    START_STREAM_ENCRYPTION_DURATION: ms,
    STOP_STREAM_ENCRYPTION_DURATION: ms,
    MERGE_SHARDS_DURATION: ms,
    SPLIT_SHARD_DURATION: ms,
    UPDATE_SHARD_COUNT_DURATION: ms,
    UPDATE_STREAM_MODE_DURATION: ms,
  }
  if (options.path) {
    Object.assign(env, { SHOULD_PERSIST_DATA: 'true', PERSIST_PATH: options.path, PERSIST_INTERVAL: '1s' })
  }
  // the caller's environment wins, so a test can still tune kinesis-mock
  for (const [key, value] of Object.entries(env)) {
    if (process.env[key] === undefined) process.env[key] = value
  }

  // kinesis-mock calls server.listen(port) or server.listen(port, "0.0.0.0"); both bind every
  // interface. Every server it opens (plain and TLS) goes through net.Server.prototype.listen.
  const listen = net.Server.prototype.listen
  net.Server.prototype.listen = function (...args) {
    const callback = typeof args[args.length - 1] === 'function' ? args.pop() : undefined
    let port
    if (args[0] !== null && typeof args[0] === 'object') port = Number(args[0].port)
    else port = Number(args[0])
    if (!Number.isInteger(port)) {
      throw new Error(`kinesis-local: refusing to listen on ${JSON.stringify(args[0])}`)
    }
    exitOnListenError('kinesis-local', this)
    if (port === options.port) this.once('listening', () => announce('kinesis-local', port))
    return callback ? listen.call(this, port, HOST, callback) : listen.call(this, port, HOST)
  }
  require(path.join(pkgDir, 'main.js'))
}

function main() {
  const options = parseArgs(process.argv.slice(2))
  if (options.name === 'kinesalite') {
    serveLevelDbEmulator(options, {
      createStreamMs: TRANSITION_MS,
      deleteStreamMs: TRANSITION_MS,
      updateStreamMs: TRANSITION_MS,
      // tests and benchmarks create many streams in one emulator's life
      shardLimit: 100000,
    })
  } else if (options.name === 'dynalite') {
    serveLevelDbEmulator(options, {
      createTableMs: TRANSITION_MS,
      deleteTableMs: TRANSITION_MS,
      updateTableMs: TRANSITION_MS,
    })
  } else {
    // cats-effect handles SIGTERM itself: it releases its resources, which persists the data
    serveKinesisLocal(options)
    return
  }
  // SIGTERM from `keo emulators down`: exit at once. Every LevelDB write has already reached
  // the operating system (its log is appended per write), so nothing acknowledged is lost.
  for (const signal of ['SIGTERM', 'SIGINT']) process.on(signal, () => process.exit(0))
}

main()

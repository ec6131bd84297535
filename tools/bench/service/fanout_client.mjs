// The foreign client of `purgatory bench fanout --client node`: the same long polls as the
// bench's own clients, sent and read by Node's own HTTP stacks (`http`: llhttp; `http2`:
// nghttp2), so the figures do not rest on the Python clients' shortcuts (issue 30).
//
// Input: one JSON argument {port, topic, waiters, partitions, offset, maxWaitMs, protocol
// ("h1" | "h2"), streamsPerConnection, deadlineMs}. Waiter i polls partition i % partitions.
// Output on stdout, one line each:
//   "opened <n>"            every request sent (registration is the bench's to see, in /healthz);
//   "first <ns>"            the first answer's last byte, process.hrtime (CLOCK_MONOTONIC, as
//                           Python's time.monotonic_ns), so the bench's burst probe can start;
//   {"answers": [...], "cpu_us": n, "errors": {...}}   at the end: [waiter, status, answered ns
//                           as a string, outcome] each, Node's user+system CPU over its life,
//                           and the client-side errors by message (a refused connect, say).
// It ends when every waiter is answered, at deadlineMs, or when stdin closes (the bench is
// done with it); nothing is written while answers arrive but the one "first" line.
import http from "node:http";
import http2 from "node:http2";

const args = JSON.parse(process.argv[2]);
const CONNECT_CONCURRENCY = 256; // connects in flight: below the service's listen backlog
const CONNECTIONS_PER_SOURCE_IP = 20000; // under one source IP's ephemeral ports

const answers = new Array(args.waiters);
const errors = {}; // error message -> count: why a waiter was answered by an error, not the service
let unanswered = args.waiters;
let finished = false;

function path(i) {
  const partition = i % args.partitions;
  return `/topics/${args.topic}/partitions/${partition}/records?offset=${args.offset}&max_wait_ms=${args.maxWaitMs}`;
}

function answered(i, status, body) {
  if (answers[i] !== undefined) return;
  const now = process.hrtime.bigint();
  if (unanswered === args.waiters) process.stdout.write(`first ${now}\n`);
  answers[i] = [status, now, body];
  unanswered -= 1;
  if (unanswered === 0) finish();
}

function failed(i, status, error) {
  const message = String(error && (error.code || error.message)).slice(0, 100);
  errors[message] = (errors[message] || 0) + 1;
  answered(i, status, "");
}

function outcome(body) {
  try {
    return JSON.parse(body).outcome ?? null;
  } catch {
    return null;
  }
}

function finish() {
  if (finished) return;
  finished = true;
  const rows = [];
  for (let i = 0; i < args.waiters; i++) {
    const a = answers[i];
    if (a !== undefined) rows.push([i, a[0], a[1].toString(), a[0] === 200 ? outcome(a[2]) : null]);
  }
  const cpu = process.cpuUsage();
  const document = { answers: rows, cpu_us: cpu.user + cpu.system, errors };
  process.stdout.write(JSON.stringify(document) + "\n", () => process.exit(0));
}

function openH1() {
  // One kept-alive connection per long poll (each request finds every pooled socket busy), as a
  // browser's or a proxy's would be: kept open after its answer, for the next poll. Not
  // `agent: false`: its one-off agent closes the socket after the response, so the service tore
  // down 10,000 connections in the middle of its burst (~50 µs of its CPU per answer, not 15).
  const agent = new http.Agent({ keepAlive: true, maxSockets: Infinity, maxFreeSockets: Infinity });
  let next = 0;
  let inFlight = 0;
  let sent = 0;
  const pump = () => {
    while (inFlight < CONNECT_CONCURRENCY && next < args.waiters) {
      const i = next++;
      inFlight += 1;
      const request = http.request({
        host: "127.0.0.1",
        port: args.port,
        path: path(i),
        agent,
        // Past the first 20,000, other source addresses: one has ~28k ephemeral ports. Not for
        // the first ones: a bound source address makes the kernel pick the port at bind(), a
        // search that slows down quadratically with the ports in use (TIME_WAIT included: the
        // second run of 10,000 registered at 266/s), where connect() picks it cheaply.
        localAddress: i < CONNECTIONS_PER_SOURCE_IP ? undefined : `127.0.0.${1 + Math.floor(i / CONNECTIONS_PER_SOURCE_IP)}`,
      });
      request.on("socket", (socket) => {
        const sentOne = () => {
          inFlight -= 1;
          sent += 1;
          if (sent === args.waiters) process.stdout.write(`opened ${sent}\n`);
          pump();
        };
        if (socket.connecting) socket.once("connect", sentOne);
        else sentOne();
      });
      request.on("response", (response) => {
        const chunks = [];
        response.on("data", (chunk) => chunks.push(chunk));
        response.on("end", () => answered(i, response.statusCode, Buffer.concat(chunks).toString()));
      });
      request.on("error", (error) => failed(i, -1, error));
      request.end();
    }
  };
  pump();
}

function openH2() {
  const perConnection = args.streamsPerConnection;
  const connections = Math.ceil(args.waiters / perConnection);
  let sent = 0;
  for (let c = 0; c < connections; c++) {
    const session = http2.connect(`http://127.0.0.1:${args.port}`, {
      peerMaxConcurrentStreams: perConnection,
      settings: { initialWindowSize: 65535 },
    });
    session.on("error", () => {});
    session.on("connect", () => session.setLocalWindowSize(16 * 1024 * 1024));
    const last = Math.min(args.waiters, (c + 1) * perConnection);
    for (let i = c * perConnection; i < last; i++) {
      const stream = session.request({ ":method": "GET", ":path": path(i) }, { endStream: true });
      let status = 0;
      const chunks = [];
      stream.on("response", (headers) => {
        status = headers[":status"];
      });
      stream.on("data", (chunk) => chunks.push(chunk));
      stream.on("end", () => answered(i, status, Buffer.concat(chunks).toString()));
      stream.on("error", (error) => failed(i, -2, error));
      stream.on("close", () => answered(i, status || -1, Buffer.concat(chunks).toString()));
      sent += 1;
    }
  }
  process.stdout.write(`opened ${sent}\n`);
}

setTimeout(finish, Math.max(0, args.deadlineMs)).unref();
process.stdin.on("end", finish);
process.stdin.resume();
if (args.protocol === "h2") openH2();
else openH1();

// Command wirefloor measures the floor under a lease renewal: what one
// small request and its answer cost a server process, in CPU per message,
// when every client keeps one TCP connection of its own to it, as every
// walden agent keeps one to every coordinator. It measures, side by side
// in one run:
//
//   - raw: plain TCP, a 30-byte length-prefixed frame (2 bytes of length,
//     28 of payload) each way, read and answered by one goroutine per
//     connection; the cheapest a Go server can answer a message.
//   - raw-tls: the same frames over TLS (the certificate of grpc-tls): the
//     floor of walden's renewals over their own connection (package
//     renewframe), one goroutine per connection.
//   - grpc: a gRPC bidirectional stream per connection, walden's own
//     walden.v1.Agent/RenewLeases with RenewLeasesRequest and
//     RenewLeasesResponse, the handler answering every request with a fixed
//     grant (no lease logic, no interceptors), on a server with the options
//     of walden's admin server that bear on each message (fixed
//     flow-control windows, 4 KiB read buffer, shared write buffer) and a
//     client with the agent's fixed window.
//   - grpc-tls: the same stream over TLS (a self-signed ECDSA P-256
//     certificate made for the run; server authentication only, which
//     changes the handshake, not what a message costs).
//
// Each transport is measured with each send slot of -slots. With slot 0 the
// sends of all the connections are spread evenly over each period
// (connection i of N sends at i/N of it), so that every message arrives
// alone; with a slot d (1ms up to half the period) each connection's time
// is rounded down to a multiple of d, so that the connections of a slot
// send together at its start, as agents renewing at a coordinator's
// renewal slots do. The period is the same either way.
//
// For each transport, slot and round it starts the server as a child
// process (this binary with -serve) and the clients in -client-procs other
// child processes (this binary with -client, told the slot by -slot):
// -conns connections in all, on 127.0.0.1, each sending -rate requests a
// second. After -warmup it samples the server's and the clients' CPU
// (utime + stime, /proc/PID/stat), scheduler wait
// (/proc/PID/task/*/schedstat), system calls and bytes (/proc/PID/io) and
// the messages answered, again after -window, and reports per transport
// and slot the median and range over -rounds of: the server's CPU per
// message answered (ms), its cores, its wait for a CPU per second it ran,
// its read and write calls, the times its threads were put on a CPU (time
// slices: a wake-up each) and the bytes read and written per message, its
// RSS, and the clients' CPU per answer. The rounds interleave the
// transports and slots, so that a change in the machine's load touches
// them alike.
//
// It owns only its temporary directory (the certificate) and the processes
// it starts, which are killed when it ends (and die with it if it is
// killed); every load loop is bounded in messages and in time.
//
// Usage (from the bench module):
//
//	go run ./wirefloor [-conns 1000] [-rate 1] [-warmup 5s] [-window 20s] [-rounds 3]
//		[-transports raw,raw-tls,grpc,grpc-tls] [-slots 0[,20ms,100ms...]] [-client-procs 2] [-o table|json]
//
// The figures and what they say: docs/scale.md.
package main

// Command raftcompare measures the commit path of a 3-member walden cluster
// against a 3-member etcd cluster, both embedded in this process on
// 127.0.0.1 with fsync on, and prints a table of proposals per second and
// p50/p99 commit latency at several concurrency levels, with the
// walden/etcd ratio; -o json prints the same as rows for scripts.
//
// Both systems are driven the same way: N goroutines on the leader each
// propose a payload of the same size and wait until it is applied (walden:
// raftnode.Node.Propose of a Noop; etcd: EtcdServer.Put, no client gRPC hop).
// Each cell runs a warm-up and then several rounds bounded by both a
// duration and an operation count; the table shows the median across rounds.
// The rounds of the two systems are interleaved so that load from other
// processes on the machine falls on both alike.
//
// It owns only its temporary data directories, which it removes on exit. It
// must never listen on anything but 127.0.0.1, and never run unbounded.
//
// Usage (from the bench module):
//
//	go run ./raftcompare [-duration 3s] [-count 20000] [-rounds 3] [-concurrency 1,16,256] [-o table|markdown|json]
package main

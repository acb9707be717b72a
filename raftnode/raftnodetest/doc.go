// Package raftnodetest is test support for raftnode: an in-memory network
// (Network) that hands out one raftnode.Transport per member and injects
// faults between them — drops, delays with jitter, partitions, isolation —
// from one seeded source, as hashicorp/raft's inmem transport does — and
// MemStorage, raft.MemoryStorage as a raftlog.Storage for members that need
// no disk.
//
// It is for tests only: no product package imports it.
package raftnodetest

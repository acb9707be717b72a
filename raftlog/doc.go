// Package raftlog is the durable raft log of one walden member: Storage,
// the contract a raft node writes its Ready through (raft.Storage plus Save,
// CreateSnapshot, Compact), and DiskStorage, which keeps it on disk.
//
// It owns the data directory's raft files: the entries and the HardState in
// an append-only log of segment files (data_dir/raftlog/*.seg: checksummed,
// numbered frames, one write and one fdatasync per Save), the directory's
// identity and the snapshots in bbolt (data_dir/raft.db), the checks that
// refuse a foreign or damaged directory at Open, the repair of what a crash
// can leave (an unfinished last write, a half-made segment, leftovers of a
// checkpoint), and the upgrade of the format-1 layout (everything in bbolt).
// DESIGN.md beside this file states its invariants; docs/raft-storage.md
// the layout byte for byte, every refusal and the crash argument.
//
// It never runs raft, never interprets a command beyond checking that it
// decodes, and never repairs anything a crash cannot leave: a damaged,
// missing or inconsistent file is refused, naming the file and offset,
// with nothing in the directory changed. It must never report a write done
// before it is on disk, nor hand back a log that does not rebuild the state
// with its snapshot.
package raftlog

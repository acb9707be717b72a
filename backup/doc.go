// Package backup owns walden's backups of the replicated state: the
// snapshot file (`waldenctl snapshot save` writes it, `walden snapshot
// status` and `restore` read it) and the restore of a new cluster from one
// (etcdutl's model: every member of the new cluster runs the restore with its
// own configuration, and they all write the same first log).
//
// A snapshot file is, in order: the 8-byte magic "WALDNSNP", the header
// (walden.v1.SnapshotHeader) as a big-endian uint32 length and its bytes,
// the data (a walden.v1.StateSnapshot, header.size bytes), and the SHA-256
// of everything before it. A file that is truncated, altered or of another
// format is refused whole; nothing of it is used.
//
// What it must never do: write into a data directory that holds anything,
// restore a snapshot it could not verify, or reuse a fencing token that the
// old cluster may have issued after the snapshot was taken.
package backup

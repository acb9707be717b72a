// Package filecheck is what walden checks of a local file before it reads
// it: that it is what it should be (a regular file, or for a WAL a block
// device too: not a FIFO that blocks the reader, not /dev/zero that never
// ends, not a directory), that it is not larger than such a file may be,
// and that a secret (a private key) or a data directory is not open to
// other users. `walden snapshot status /dev/zero` once grew to 2.7 GB and
// kept growing; a FIFO hung it; a 0644 private key and a 0777 data
// directory were accepted silently.
//
// What it owns: the checks and their errors, which name the file and say
// what to do (the chmod to run).
//
// What it must never do: change a file (it tells the user the chmod, it
// does not run it), or read more of a file than its bound.
package filecheck

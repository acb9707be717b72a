// Package version says which build of walden is running: the version and
// commit stamped by the Makefile through -ldflags, or, for a plain `go build`
// or `go install`, what the Go toolchain recorded in the binary
// (debug.ReadBuildInfo), and the Go version. It also exports the
// walden_build_info metric.
//
// What it must never do: read files, the network or the environment; it only
// reports what the binary carries.
package version

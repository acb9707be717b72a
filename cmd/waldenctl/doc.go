// Command waldenctl is the admin CLI of a walden coordinator cluster. It
// speaks the gRPC admin API (walden.v1.Cluster) of any member, tries every
// endpoint before giving up and follows the leader hint of a not-leader
// answer.
//
// Every command lives in its own file and registers itself on the root
// command in an init function; client.go holds what they share (endpoints,
// TLS, timeout, output format).
package main

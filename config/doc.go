// Package config owns walden's configuration files: the Go structs, their
// defaults, a strict YAML decoder that remembers where every key was written,
// and the validators that name the file, the line and the key of a mistake.
//
// It never touches anything but the configuration file it is asked to read:
// no data directory, no socket, no certificate file. Deciding whether a
// data directory holds state belongs to the server.
package config

// Package docgen writes the reference pages that are generated from the
// code, so that they cannot drift from it: the configuration references
// (every key of a config struct, its default from the struct's default
// value, and the text of its Go doc comment, where each key's limits are
// stated) and the command-line reference (every cobra command and flag).
// Tests in the packages that own the structs and commands compare the pages
// with what it writes and fail on a difference; `make docs` writes them.
//
// What it owns: the Markdown of those pages and the markers that delimit a
// generated region inside a hand-written page.
//
// What it must never do: hold text of its own about a key or a command (the
// text is the code's), or be imported by a product package (only tests and
// `make docs` use it).
package docgen

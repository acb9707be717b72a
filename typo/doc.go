// Package typo finds the word a person probably meant: the known name
// nearest by edit distance to one that is not known (a configuration key,
// a flag, a command's word, an id), so that a refusal can say "did you
// mean ...?".
//
// What it owns: the edit distance and the choice of the nearest candidate.
//
// What it must never do: decide how near is near enough (the caller passes
// the bound its names call for), or accept a value on the caller's behalf:
// a suggestion is only ever shown.
package typo

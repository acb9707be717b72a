// Command walden-chaos runs walden's chaos scenarios on Linux network
// namespaces and prints their results (`make chaos`). It needs root; without
// it, or without network namespaces, it says why and exits with status 0
// having run nothing.
package main

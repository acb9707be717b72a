package typo

// Distance is the Levenshtein distance between a and b: the fewest byte
// insertions, deletions and substitutions that turn one into the other.
func Distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// Closest returns the candidate nearest to s when it is at most maxDist
// away, else "". Of candidates equally near, the first wins; a candidate
// equal to s is passed over (s is known, not a typo of it).
func Closest(s string, candidates []string, maxDist int) string {
	best, bestD := "", -1
	for _, c := range candidates {
		if c == s {
			continue
		}
		if d := Distance(s, c); bestD < 0 || d < bestD {
			best, bestD = c, d
		}
	}
	if bestD < 0 || bestD > maxDist {
		return ""
	}
	return best
}

package typo

import "testing"

func TestDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"", "abc", 3},
		{"abc", "", 3},
		{"data_dir", "data_dir", 0},
		{"data_dr", "data_dir", 1},   // deletion
		{"data_dirr", "data_dir", 1}, // insertion
		{"data_dor", "data_dir", 1},  // substitution
		{"dtaa_dir", "data_dir", 2},  // transposition: two edits
		{"kitten", "sitting", 3},
		{"flaw", "lawn", 2},
	} {
		if got := Distance(tc.a, tc.b); got != tc.want {
			t.Errorf("Distance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
		if got := Distance(tc.b, tc.a); got != tc.want {
			t.Errorf("Distance(%q, %q) = %d, want %d (symmetric)", tc.b, tc.a, got, tc.want)
		}
	}
}

func TestClosest(t *testing.T) {
	words := []string{"table", "json", "yaml"}
	for _, tc := range []struct {
		s     string
		cands []string
		max   int
		want  string
	}{
		{"jsno", words, 2, "json"},
		{"jsno", words, 1, ""}, // two edits away
		{"tabel", words, 2, "table"},
		{"xml", words, 1, ""},
		{"json", words, 2, ""},                // known: no suggestion of another word
		{"ab", []string{"ax", "ay"}, 1, "ax"}, // a tie: the first
		{"ab", []string{"ay", "ax"}, 1, "ay"}, // a tie: the first
		{"ab", []string{"abc", "ax", "a"}, 1, "abc"},
		{"anything", nil, 5, ""},
	} {
		if got := Closest(tc.s, tc.cands, tc.max); got != tc.want {
			t.Errorf("Closest(%q, %q, %d) = %q, want %q", tc.s, tc.cands, tc.max, got, tc.want)
		}
	}
}

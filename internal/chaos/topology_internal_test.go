package chaos

import "testing"

func TestSimSeed(t *testing.T) {
	tests := []struct {
		flags []string
		want  int64
		bad   bool
	}{
		{nil, 1, false},
		{[]string{"--ttft", "100ms"}, 1, false},
		{[]string{"--seed", "7"}, 7, false},
		{[]string{"-seed=8", "--ttft", "1ms"}, 8, false},
		{[]string{"--seed", "7", "--seed=9"}, 9, false},
		{[]string{"--seed"}, 0, true},
		{[]string{"--seed", "x"}, 0, true},
	}
	for _, tc := range tests {
		got, err := simSeed(tc.flags)
		if (err != nil) != tc.bad || !tc.bad && got != tc.want {
			t.Errorf("simSeed(%q) = %d, %v; want %d (error %v)", tc.flags, got, err, tc.want, tc.bad)
		}
	}
}

//go:build !unix

package embedded

import "os"

// lockDir does not lock where flock is not available.
func lockDir(string) (*os.File, error) { return nil, nil }

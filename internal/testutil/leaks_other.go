//go:build !linux

package testutil

// HostLeaks finds nothing off Linux: no test there mounts.
func HostLeaks(dir string) ([]string, error) { return nil, nil }

// MountsUnder finds nothing off Linux.
func MountsUnder(dir string) ([]string, error) { return nil, nil }

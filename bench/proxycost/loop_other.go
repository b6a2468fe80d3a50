//go:build !linux

package proxycost

import (
	"context"
	"errors"
)

// ServeLoop is Linux only (epoll).
func ServeLoop(ctx context.Context, addr, upstream string) error {
	return errors.New("epoll-bare: Linux only (epoll)")
}

package main

import (
	"context"
	"os"

	"go.uber.org/zap"
)

// hupReloader reloads the configuration on every signal from hup
// (SIGHUP), one at a time, until its context ends. A rejected reload
// leaves the running configuration as it was and logs every problem.
type hupReloader struct {
	hup    <-chan os.Signal
	reload func() error
	log    *zap.Logger
}

func (h hupReloader) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-h.hup:
			if err := h.reload(); err != nil {
				h.log.Error("reload rejected, configuration unchanged", zap.Error(err))
			}
		}
	}
}

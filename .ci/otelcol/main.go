// Command otelcol is an OpenTelemetry Collector with exactly what the
// tracing tests need: the OTLP receiver (gRPC and HTTP) and the file
// exporter (OTLP JSON, one line per batch). It is what the Collector
// builder (ocb) would generate for that component list, written by hand so
// that CI needs nothing but the Go module proxy; .ci/otelcol/build compiles
// it at the versions go.mod pins, all from one Collector release.
//
// Its configuration comes from --config FILE (the tests write one per run,
// see tracing/otelcoltest), with ${env:VAR} expanded.
package main

import (
	"fmt"
	"os"

	"github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/envprovider"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry/otelconftelemetry"
)

func components() (otelcol.Factories, error) {
	var f otelcol.Factories
	var err error
	if f.Receivers, err = otelcol.MakeFactoryMap[receiver.Factory](otlpreceiver.NewFactory()); err != nil {
		return f, err
	}
	if f.Exporters, err = otelcol.MakeFactoryMap[exporter.Factory](fileexporter.NewFactory()); err != nil {
		return f, err
	}
	// The Collector's own logs and (switched off by the tests) metrics.
	f.Telemetry = otelconftelemetry.NewFactory()
	return f, nil
}

func main() {
	cmd := otelcol.NewCommand(otelcol.CollectorSettings{
		BuildInfo: component.BuildInfo{
			Command:     "otelcol-gpurouter-ci",
			Description: "OpenTelemetry Collector for gpurouter's tracing tests (OTLP receiver, file exporter)",
			Version:     version,
		},
		Factories: components,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				// The command expands ${VAR} from the environment by
				// default, so it needs the env provider beside the file.
				ProviderFactories: []confmap.ProviderFactory{fileprovider.NewFactory(), envprovider.NewFactory()},
			},
		},
	})
	if err := cmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// version is the Collector release the modules come from (go.mod), set
// at link time by the build script.
var version = "unknown"

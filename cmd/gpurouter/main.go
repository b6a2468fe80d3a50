// Command gpurouter is a GPU-aware router for fleets of vLLM replicas, with
// its own simulator and benchmark. See README.md and ../shared/DESIGN.md.
package main

import (
	"fmt"
	"io"
	"os"
)

// command is one subcommand: run gets the arguments after its name and
// returns the process exit code.
type command struct {
	name    string
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
}

func commands() []command {
	return []command{
		{"serve", "run the router (--config FILE, or --listen ADDR --pool MODEL=URL[,URL...])", runServe},
		{"bench", "load generator and reports (vllm bench serve flags, client/router/engine latency)", runBench},
		{"sim", "simulated vLLM replicas on loopback (continuous batching, KV blocks, vLLM metrics, faults)", runSim},
		{"demo", "simulated fleet + router + benchmark in one process: the full report (no GPU needed)", runDemo},
		{"agent", "serve this host's NVML GPU stats over HTTP for routers on other hosts", runAgent},
	}
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	name := args[0]
	if name == "help" || name == "-h" || name == "--help" {
		usage(stdout)
		return 0
	}
	for _, c := range commands() {
		if c.name == name {
			return c.run(args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "gpurouter: unknown command %q\n\n", name)
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "gpurouter: a GPU-aware router for vLLM fleets")
	fmt.Fprintln(w, "\nusage: gpurouter COMMAND [flags]   (gpurouter COMMAND -h for its flags)")
	fmt.Fprintln(w, "\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "  %-8s %s\n", "help", "this list")
}

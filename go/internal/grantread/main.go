// Command grantread prints what package grant reads from each directory given, one JSON line
// each: tests/unit/test_go_grant_parity.py compares it with the Python client's reading.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/fencedlease/fencedlease/go/grant"
)

type reading struct {
	Dir        string `json:"dir"`
	Absent     bool   `json:"absent"`
	Error      string `json:"error,omitempty"`
	Token      int64  `json:"token,omitempty"`
	LeaseID    string `json:"leaseId,omitempty"`
	ValidUntil string `json:"validUntil,omitempty"`
	State      string `json:"state,omitempty"`
}

func main() {
	out := json.NewEncoder(os.Stdout)
	for _, dir := range os.Args[1:] {
		r := reading{Dir: dir}
		g, err := grant.ReadDir(dir, "")
		switch {
		case err != nil:
			r.Error = err.Error()
		case g == nil:
			r.Absent = true
		default:
			r.Token, r.LeaseID, r.State = g.Token, g.LeaseID, g.State
			r.ValidUntil = g.ValidUntil.UTC().Format(time.RFC3339Nano)
		}
		if err := out.Encode(r); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}

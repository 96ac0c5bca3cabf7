package main

import "os"

// stderr is where progress goes, so that stdout holds the tables alone.
var stderr = os.Stderr

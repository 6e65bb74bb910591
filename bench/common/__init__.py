"""What the suites share: the run's frame (`harness`), started processes (`processes`),
one HTTP call (`httpcall`), /proc readings (`procfs`) and the Rust peer routers (`peers`,
installed by `peers.sh`)."""

"""The tools used while a server serves: the qualification bench and its receipts (`bench/`,
`make bench`, `make compare`), the soak (`make soak`), `make top`, and the Grafana dashboard's
panels. They read the server through smoke's client and metric names (`smoke.client`,
`smoke.metrics`); the subcommands are `commands/`, one module each (`python -m serving`)."""

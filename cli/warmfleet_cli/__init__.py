"""`warmfleet`: one command line over every component, and the client-side tools.

The dispatcher (`main`) imports a subcommand's module only when that subcommand runs, so
`warmfleet router --help` loads neither mlx nor kopf. `up` (the fleet on one machine),
`bench-serve`/`bench-compare` and `audit` live here: they use the components, none of
the components uses them."""

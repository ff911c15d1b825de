"""What the files hold: clusters (and the catalog they are built from), plans, units."""

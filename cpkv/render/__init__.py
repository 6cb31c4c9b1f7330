"""Human output: tables and reports drawn from the report objects; renderers never run ranks."""

"""Everything a page shows (framework-free): it reads results and never writes them."""

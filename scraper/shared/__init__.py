"""The floor the scraper's stages stand on: small types and interfaces they share, so
that discover, scrape, decide, write and stall need not import each other
(docs/architecture.md, "Inside the scraper").  Nothing here does I/O.
"""

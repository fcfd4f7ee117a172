"""The rule mutant tier: small bugs in the product's safety rules that the fast tests must catch."""

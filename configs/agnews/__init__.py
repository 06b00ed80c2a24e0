"""AG News with BERT's encoder (SimpleTRON section 5.3, Table 2; docs/bert.md)."""

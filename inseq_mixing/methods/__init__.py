"""Pure method math on a recorded forward pass: no Inseq import here."""

"""The grid engine of the fast NumPy backend: polyphase geometry, scratch, chunking, weight layout, and one
module per strategy (A: dy-columns, B: x-columns, pointwise, the forward). :mod:`..paths` chooses among them."""

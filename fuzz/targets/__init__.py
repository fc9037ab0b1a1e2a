"""One module per fuzz target. Each defines NAME, setup() and test_one_input(data: bytes),
which must raise nothing for any input: an exception is a crash found."""

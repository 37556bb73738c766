"""How pybk's gRPC travels, on one HTTP/2 engine, libnghttp2 (through the `ngh2` package):
grpc_server (the bookie's gRPC server) over ngh2_server (its connections and calls), ngh2_client
(the client's Add stream), grpc_message (what gRPC adds to HTTP/2, for both sides) and budget
(what the server holds for all its clients). The schema and its generated code are pybk.proto's."""

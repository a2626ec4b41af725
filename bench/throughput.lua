-- bench/throughput.lua - wrk's request for bench/throughput.sh: a POST of
-- the JSON body in the file $AG_TP_BODY.
local f = assert(io.open(os.getenv("AG_TP_BODY"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-bench"

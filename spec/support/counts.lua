-- busted output handler: one '.', 'F', 'E' or 'S' per test, the details of
-- every failure, and a summary.  When PE_RESULTS names a file, the counts
-- are appended to it as "passed failed skipped" so tools/runtests can add
-- up several runs and print the final "N passed, N failed" line.  When
-- PE_CURRENT names a file, it holds the name of the test running (so that
-- tools/runtests can name the test of a suite it had to kill).  When
-- PE_TIMES names a file, each test's wall time is appended to it as
-- "seconds<TAB>suite<TAB>file<TAB>name" (tools/runtests: PE_TIMES=FILE).
return function(options)
  local busted = require("busted")
  local handler = require("busted.outputHandlers.base")()
  local out = io.stdout
  local suite = os.getenv("PE_SUITE") or (jit and jit.version or _VERSION)

  local function name_of(element)
    return handler.getFullName(element)
  end

  local current = os.getenv("PE_CURRENT")
  handler.testStart = function(element)
    local f = io.open(current, "w")
    if f then
      f:write(name_of(element), "\n")
      f:close()
    end
    return nil, true
  end

  local times = os.getenv("PE_TIMES")
  local started = {}
  local function uptime()
    local f = io.open("/proc/uptime")
    local t = f and f:read("*n")
    if f then f:close() end
    return t or os.time()
  end
  local function time_start(element)
    started[element] = uptime()
    return nil, true
  end
  local function time_end(element)
    local t0 = started[element]
    if t0 then
      started[element] = nil
      local f = io.open(times, "a")
      if f then
        local src = element.trace and element.trace.short_src or "?"
        f:write(("%.2f\t%s\t%s\t%s\n"):format(uptime() - t0, suite, src, name_of(element)))
        f:close()
      end
    end
    return nil, true
  end

  handler.testEnd = function(element, parent, status)
    local c = ({ success = ".", failure = "F", error = "E", pending = "S" })[status] or "?"
    out:write(c)
    out:flush()
    return nil, true
  end

  handler.suiteEnd = function()
    out:write("\n")
    for _, p in ipairs(handler.pendings) do
      local why = p.message ~= nil and (" -- " .. tostring(p.message)) or ""
      out:write(("  skipped: %s%s\n"):format(name_of(p.element), why))
    end
    local function report(kind, list)
      for _, f in ipairs(list) do
        out:write(("\n%s [%s]: %s\n"):format(kind, suite, name_of(f.element)))
        if f.trace and f.trace.short_src then
          out:write(("  at %s:%s\n"):format(f.trace.short_src, tostring(f.trace.currentline)))
        end
        out:write("  " .. tostring(f.message):gsub("\n", "\n  ") .. "\n")
      end
    end
    report("FAILED", handler.failures)
    report("ERROR", handler.errors)
    local passed = #handler.successes
    local failed = #handler.failures + #handler.errors
    local skipped = #handler.pendings
    out:write(("[%s] %d passed, %d failed, %d skipped\n"):format(suite, passed, failed, skipped))
    local file = os.getenv("PE_RESULTS")
    if file then
      local f = assert(io.open(file, "a"))
      f:write(("%d %d %d\n"):format(passed, failed, skipped))
      f:close()
    end
    return nil, true
  end

  if current then busted.subscribe({ "test", "start" }, handler.testStart) end
  if times then
    busted.subscribe({ "test", "start" }, time_start)
    busted.subscribe({ "test", "end" }, time_end)
  end
  busted.subscribe({ "test", "end" }, handler.testEnd, { predicate = handler.cancelOnPending })
  busted.subscribe({ "suite", "end" }, handler.suiteEnd)
  busted.subscribe({ "error", "file" }, handler.error)
  busted.subscribe({ "failure", "file" }, handler.error)
  busted.subscribe({ "error", "describe" }, handler.error)
  busted.subscribe({ "failure", "describe" }, handler.error)
  return handler
end

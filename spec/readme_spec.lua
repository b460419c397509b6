-- README.md's recipes run as written: its ```lua blocks, in order, as one
-- program (a later block uses the `pe` of the first), and every `luaperf`
-- and `autoprofile` command of its ```sh blocks, with `./prog` and
-- `app.lua` standing for a small program of the spec's own and every output
-- file put in a temporary directory.  Each command's output is read back.
local U = require("support.util")

local readme = U.slurp("README.md")
local interp = U.lua_cmd()
local build = os.getenv("PE_BUILD") or (jit and "build" or ("build/" .. interp))

local function blocks(lang)
  local out = {}
  for body in readme:gmatch("\n```" .. lang .. "\n(.-)\n```") do out[#out + 1] = body end
  return out
end

-- a scratch directory, removed by the caller's finally
local function scratch()
  local dir = U.sh("mktemp -d"):gsub("%s+$", "")
  assert(dir:match("^/"), "mktemp -d failed")
  return dir
end

local APP = [[
local function gamma(n) local s = 0 for i = 1, n do s = s + (i * 7) % 13 end return s end
local function alpha() local t = 0 for _ = 1, 400 do t = t + gamma(20000) end return t end
print(alpha())
]]

describe("README.md", function()
  it("is at most 150 lines and shows the recipes a user starts from", function()
    local n = select(2, readme:gsub("\n", "\n"))
    assert.is_true(n <= 150, "README.md has " .. n .. " lines")
    for _, s in ipairs({ "pe.profile.start", "perf_event.autoprofile", "perf_event.openresty",
                         "luaperf record --lua", "pe.stat", "make test" }) do
      assert.truthy(readme:find(s, 1, true), "README.md does not show " .. s)
    end
  end)

  it("runs its Lua blocks as one program", function()
    local lua = blocks("lua")
    assert.is_true(#lua >= 4, #lua .. " lua blocks")
    local dir = scratch()
    finally(function() os.execute("rm -rf '" .. dir .. "'") end)
    local prog = table.concat({
      ("package.path = 'lua/?.lua;lua/?/init.lua;' .. package.path"),
      ("package.cpath = '%s/?.so;' .. package.cpath"):format(build),
      "local function work() local s = 0 for i = 1, 3e6 do s = s + i % 7 end return s end",
      table.concat(lua, "\n"),
    }, "\n")
    local f = assert(io.open(dir .. "/readme.lua", "w"))
    f:write(prog)
    f:close()
    local out, rc = U.run(interp .. " " .. dir .. "/readme.lua 2>&1")
    assert.equal(0, rc, out)
    assert.truthy(out:find("Performance counter stats", 1, true), out)   -- pe.stat's print
    assert.truthy(out:find("\nmain@[^\n]*work@[^\n]* %d+\n") or out:find("\n[^\n]*work@[^\n]* %d+\n"),
                  "no folded line of work() in:\n" .. out)
    assert.truthy(out:find("tsc", 1, true) or not U.readable("/sys/bus/event_source/devices/msr"),
                  "pe.list('msr') printed no tsc:\n" .. out)
  end)

  it("runs its luaperf and autoprofile commands", function()
    local dir = scratch()
    finally(function() os.execute("rm -rf '" .. dir .. "'") end)
    local f = assert(io.open(dir .. "/app.lua", "w"))
    f:write(APP)
    f:close()
    -- ./prog: a C program that spins in user space (the test fixture)
    local prog = "build/test/petarget spin 30000000"
    local n = 0
    for _, body in ipairs(blocks("sh")) do
      for line in body:gmatch("[^\n]+") do
        local cmd = line:gsub("%s+#.*$", "")
        if cmd:find("luaperf", 1, true) or cmd:find("autoprofile", 1, true) then
          n = n + 1
          if cmd:find("syscalls:", 1, true) and not U.can_trace() then
            cmd = cmd:gsub(",syscalls:[%w_]+", "")     -- tracefs is root's
          end
          local outfile = cmd:match("%-o (%S+)") or cmd:match("PE_PROFILE_OUT=(%S+)")
          cmd = cmd:gsub("%./prog", prog):gsub(" app%.lua", " " .. dir .. "/app.lua")
                   :gsub("luajit (%S*app%.lua)", interp .. " %1")
                   :gsub("%-o (%S+)", "-o " .. dir .. "/%1")
                   :gsub("PE_PROFILE_OUT=(%S+)", "PE_PROFILE_OUT=" .. dir .. "/%1")
                   :gsub("^bin/luaperf", interp .. " bin/luaperf")
                   :gsub("luajit %-l", interp .. " -l")
          local env = ("LUA_PATH='lua/?.lua;lua/?/init.lua;;' LUA_CPATH='%s/?.so;;' "):format(build)
          -- -p PID: a plain LuaJIT program spinning meanwhile
          local target = cmd:find("-p PID", 1, true)
            and tonumber(U.sh("sh -c 'luajit -e \"while true do end\" >/dev/null 2>&1 & echo $!'"))
          if target then cmd = cmd:gsub("%-p PID", "-p " .. target) end
          local out, rc = U.run(env .. cmd .. " 2>&1")
          if target and cmd:find(" record ", 1, true) then
            U.sh("kill " .. target)
          elseif target then
            U.sh("kill " .. target)
            assert.truthy(out:find(("Thread %d %%(LuaJIT VM 0x%%x+%%): "):format(target)), cmd .. "\n" .. out)
          end
          assert.equal(0, rc, cmd .. "\n" .. out)
          if outfile then
            local data = U.read(dir .. "/" .. outfile)
            assert.truthy(data and #data > 0, cmd .. ": no " .. outfile .. "\n" .. out)
            if outfile:match("%.data$") then
              assert.equal("PERFILE2", data:sub(1, 8), cmd)
            elseif outfile:match("%.gz$") then
              assert.equal("\31\139", data:sub(1, 2), cmd)
            else
              for l in data:gmatch("[^\n]+") do assert.truthy(l:match("^.+ %d+$"), cmd .. ": " .. l) end
              if outfile:match("^app") then
                assert.truthy(data:find("gamma@", 1, true), cmd .. ": no Lua frame gamma@ in\n" .. data)
              end
            end
          elseif cmd:find(" stat ", 1, true) then
            assert.truthy(out:find("task%-clock"), cmd .. "\n" .. out)
          elseif cmd:find(" list ", 1, true) then
            assert.truthy(out:find("cpu%-clock"), cmd .. "\n" .. out)
          end
        end
      end
    end
    assert.is_true(n >= 8, n .. " commands")
  end)
end)

// The torch headers nearly every engine file needs (precompiled as pch/engine_pch.h).
#pragma once
#include "engine/pch/engine_pch.h"
